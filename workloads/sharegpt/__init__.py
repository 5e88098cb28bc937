"""ShareGPT-derived workloads: loading (loader), token counting (tokenizer),
the working-point derivation (derive) and arrival processes (arrivals)."""

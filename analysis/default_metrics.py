"""What ``hbench analyze`` compares unless told: throughput, TTFT (median
and tail) and the tail of the time per output token.

Both kinds by default because which one tells organizations apart depends on
the load: under a growing queue throughput is the service rate each
sustains, in a steady state it only echoes the offered load and latency is
the difference (`harness.validity`, validity per metric). A module of its
own so that ``--help`` can name them without importing the statistics.
"""

THROUGHPUT = "throughput_ledger_tok_s"
DEFAULT_METRICS = (THROUGHPUT, "ttft_p50_s", "ttft_p99_s", "tpot_p99_s")

"""Workloads: request streams that every engine and organization replays identically."""

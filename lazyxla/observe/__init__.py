"""What lazyxla did and why: counters and timers, sync and recompile diagnostics, profiler spans."""

"""Differential testing against eager: the OpInfo sweep, the random-program fuzzer, and the
comparison both use (see docs/testing.md)."""

"""The fit check: whether a config's train step fits a TPU slice, or this machine's
devices, by ahead-of-time compiles (`python -m bertjax.fit`; docs/fit.md)."""

"""Demos and benchmarks: the starter problems, `kvgraft demo`, `kvgraft bench`. Only cli/ imports lab/."""

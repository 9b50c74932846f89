"""The four numbers: which they are and how each is gated, matched and kept (``catalogue``),
what each one is (value, source, bound) and how every surface shows it."""

"""The four numbers: what each one is (value, source, bound) and how every surface shows it."""

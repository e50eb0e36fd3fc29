"""`prism demo`: a realistic load of legacy shapes, signed and unsigned, some deliberately bad."""

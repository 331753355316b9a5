"""The synthetic multilingual product catalogue: attributes, hand-written lexicons, rendering, generation,
and the catalogue's on-disk record format (data tooling used by training, tests, probes and the demo; not
the model)."""

"""The round loop (`rounds.Generation`): draft through the chain, verify in one target
batch, accept exactly, commit, cut the caches back. Its events and the one record of a
round (`events`), the counters (`stats`) and the draft-length policy it consults
(`lengths`)."""

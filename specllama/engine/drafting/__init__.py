"""Drafting: every source of draft tokens behind one interface (`base.Drafter`: begin /
draft / accept), and the chain the round loop asks (`chain.DraftChain`).

Sources: tokens a constraint forces (`forced`), lookups in text seen before (`lookup`,
over the context's `ngram` index and the `suffixcache` archives of earlier calls, a
persisted `cachefile` and a `corpus`, gathered by `draftcache`; `following` earlier
replies of one shape), and the draft model (`model`), across tokenizers through
`crossvocab`. Drafting never imports the round loop.
"""

"""Decode functions that break the contract decode(model, tokens, positions, mask, cache) ->
(logits, cache)."""


def logits_only(model, tokens, positions, mask, cache=None):
    return model(tokens)


def last_token_only(model, tokens, positions, mask, cache=None):
    return model(tokens)[:, -1], cache

"""ADRs as code: the record model, parser, renderer, validator, matcher and store."""

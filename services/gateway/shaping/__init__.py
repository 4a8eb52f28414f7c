"""Request shaping: who may call (API keys), how often (rate limits), how many at once (admission with
priorities and a bounded queue) and for how long (deadlines). Order of checks: DESIGN.md "Request shaping"."""

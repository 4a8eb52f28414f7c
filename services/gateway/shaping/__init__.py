"""Request shaping: who may call (API keys), how often (rate limits), how many at once (admission with
priorities and a bounded queue), for how long (deadlines) and how deep the JSON it sends outside inference may
nest (``json_limits``). Order of checks: docs/architecture.md, "Admission"."""

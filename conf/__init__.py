"""The layered YAML config (base + per-environment overlays), installed as ``sparkdeep.conf`` so a wheel carries it."""

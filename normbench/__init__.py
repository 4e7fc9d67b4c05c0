"""normbench: measured answers to "LayerNorm or RMSNorm? pre or post?" on small GPT models."""

__version__ = "0.1.0"

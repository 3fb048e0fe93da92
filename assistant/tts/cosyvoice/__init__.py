"""tts/cosyvoice."""

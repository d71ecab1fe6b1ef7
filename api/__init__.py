"""`localinfer serve`: OpenAI- and Ollama-compatible HTTP APIs over the batching engine."""

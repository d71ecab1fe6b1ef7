"""The local REST API (OpenAI and Ollama dialects). Not built yet: see the REST API issue."""

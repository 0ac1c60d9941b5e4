"""`kvgraft serve`: the OpenAI HTTP API over the library, with a prompt cache that survives restarts."""

"""The OpenAI-compatible protocol: request/response models and the endpoint handlers."""

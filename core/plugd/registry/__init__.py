"""Moving models between the store and OCI distribution registries (Ollama's registry among them).

`pull.pull_model` and `push.push_model` are the entry points; `transport` decides which connections and
redirects are safe, `auth` answers bearer-token challenges, `client` speaks the distribution API.
"""

"""Pulling models from the Hugging Face Hub: `plugd pull hf.co/ORG/REPO[:REVISION]`.

`reference` reads such a name, `files` picks from the repository's file list what plugd runs, `download`
fetches those into the user's Hugging Face cache through huggingface_hub (one progress line per file),
`follow` hashes each file as it lands, `importing` makes cached files blobs of the store without a second
copy, `errors` turns the Hub's answers into messages a user can act on, and `pull.pull_from_hub` does it all
and creates the model as `plugd create` would. `testing` is a loopback server speaking the Hub's HTTP API, for
tests and benchmarks.
"""

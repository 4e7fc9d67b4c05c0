"""A user's own norm or placement: the starting module, config and test ``normbench new`` writes
(`scaffold`), and the contract ``normbench check`` holds it to (`conformance`).

Imports the model, the training loop, the norm bench and the core.
"""

"""Data: the synthetic process and its exact floor, text files, tiny-shakespeare (`corpus`).

Imports only the core: no model, no training.
"""

"""The broker's request handlers for clients and for the controller routing, and its lifecycle
toward the controller.
"""

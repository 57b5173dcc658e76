"""TODO stage docstring"""

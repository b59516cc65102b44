"""Folder-level jobs: the engine protocol, the local and Ray engines, and the jobs themselves.
"""

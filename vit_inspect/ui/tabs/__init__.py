"""The app's tabs, one module per tab.
"""

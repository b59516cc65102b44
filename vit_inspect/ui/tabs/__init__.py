"""The app's tabs, one module per tab, each in one shape: `layout()` builds its `gr.Tab` inside the page's
`gr.Tabs` and returns a frozen View of its components; `wire(view, ...)`, where the tab has events of its
own, attaches them, with handlers from the tab's own module or the page's `Inspector`. No tab imports
another; what they share lives beside them in `vit_inspect.ui` (`common`, `panels`, `view`, `clicks`).
"""

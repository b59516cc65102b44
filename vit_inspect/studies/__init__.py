"""Questions that run the model many times: ablation and head importance, faithfulness scoring,
model comparison and the model-level report.
"""

"""Questions that run the model many times: ablation and head importance, faithfulness scoring, sanity
checks (model randomisation, random logit) and robustness, model comparison and the model-level report.
"""

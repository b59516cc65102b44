"""The one pass per image: capture, relevance rules, interventions (head ablation, model randomisation), the
logit lens, head statistics, the attention store and its spill, gradient rollouts, and `analyze_image` with its
result type.
"""

"""What a ViT is to vit_inspect: errors, token layout, images, input geometry, the hub, the model
handle, weights, and loading from timm, Hugging Face or a hand-written module.
"""

"""Exceptions the library raises on purpose. Their messages are written for the user to read:
the command line prints them as one line; the app shows their `public` text, which never names
a server path."""


class VitInspectError(Exception):
    """Base class: something the user can fix, explained in the message.

    `str(exc)` is the full detail for the operator and the command line (it may name server
    paths); `exc.public` is the sentence a web user may see, the same text unless the raiser gave
    one without server details.
    """

    def __init__(self, message: str = "", *, public: str | None = None):
        super().__init__(message)
        self.public = message if public is None else public


class ImageError(VitInspectError):
    """The image cannot be read, or is outside the configured limits."""


class ModelNotFoundError(VitInspectError):
    """The model name is unknown to timm and is not a Hugging Face model folder or id."""


class UnsupportedModelError(VitInspectError):
    """The model exists but is not a ViT whose attention we can capture."""


class ModelTooLargeError(VitInspectError):
    """The model is larger than this server allows one model to be."""


class WeightsError(VitInspectError):
    """A weights file is unreadable, unsafe, or does not fit the architecture."""


class WeightsNotFoundError(WeightsError):
    """No local weights and the hub cannot be reached; the message names the file to provide."""


class InputError(VitInspectError):
    """A value a client sent is of the wrong type, out of range, or names a file it may not read."""


class CaptureError(VitInspectError):
    """A forward pass did not yield an attention map for every layer."""


class InterventionError(VitInspectError):
    """A head ablation cannot be applied as asked (unknown head or mode, missing or misfit means)."""


class Cancelled(VitInspectError):
    """A long computation was stopped at the caller's request."""


class SmallImageWarning(UserWarning):
    """An image was analysed, but it is so small that the model sees an enlarged blur of it
    (`geometry.enlarged_blur`); the message is the sentence a user reads."""

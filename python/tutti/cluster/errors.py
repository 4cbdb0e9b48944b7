"""The cluster tier's errors: each a one-line reason, never a traceback for a user."""


class ClusterError(RuntimeError):
    """The cluster tier cannot do what was asked (Mooncake missing, master unreachable, bad config)."""


class DescriptorError(ValueError):
    """A value in the cluster index that is not a location descriptor this tutti trusts: wrong magic,
    version, length or check, another model, or a geometry unlike the local store's."""

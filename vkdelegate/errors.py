"""The one exception type vkdelegate raises for bad input and failed Vulkan calls."""


class VkDelegateError(ValueError):
    """Raised for any problem vkdelegate detects: a malformed blob or program file, an
    unsupported option, a Vulkan call that failed, a tensor over a device limit.

    The message names the problem and where it is (file, byte offset, value id, op,
    shape), so that the CLI can print it as one line and exit with status 2.
    A subclass of ValueError so that callers that already catch bad-input errors keep
    working.
    """

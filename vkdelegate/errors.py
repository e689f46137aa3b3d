"""The one exception type vkdelegate raises for bad input and failed Vulkan calls."""


class VkDelegateError(ValueError):
    """Raised for any problem vkdelegate detects: a malformed blob or program file, an
    unsupported option, a Vulkan call that failed, a tensor over a device limit.

    The message names the problem and where it is (file, byte offset, value id, op,
    shape), so that the CLI can print it as one line and exit with status 2.
    A subclass of ValueError so that callers that already catch bad-input errors keep
    working.
    """


class DeviceLimitError(VkDelegateError):
    """Raised when a valid program does not fit the chosen Vulkan device: a tensor over
    ``maxStorageBufferRange`` or the largest allocation, too many allocations, a
    dispatch over the workgroup limits, or a shader loop over llvmpipe's budget.

    Raised while a delegate is built (before the offending memory is allocated), so
    the program layer can run that delegate on the CPU instead (see
    ``vkdelegate.backend.program``).
    """


class ResourceLimitError(VkDelegateError):
    """Raised when a program file or blob asks for more than its load limits allow
    (``vkdelegate.limits.LoadLimits``): device or host memory, one tensor's size, the
    nesting of its manifest or values, its node or segment count.

    Raised at load, before anything is allocated or compiled; the message names the
    limit, where it was exceeded and by what value.
    """


class NotPicklableError(VkDelegateError, TypeError):
    """Raised by ``pickle`` and ``copy`` of a lowered program or one of its methods:
    it holds device resources, locks and a Vulkan device; ``program.save(path)`` and
    ``vkdelegate.load(path)`` are how a program travels or is duplicated.

    Also a TypeError, the error pickle's protocol raises for an object that cannot be
    pickled (callers that catch it keep working).
    """


def not_picklable(what: str) -> NotPicklableError:
    """The NotPicklableError for ``what`` ("a lowered program", ...)."""
    return NotPicklableError(f"{what} cannot be pickled or copied (it holds device "
                             f"resources); save it with program.save(path) and load a "
                             f"new one with vkdelegate.load(path)")


def printable(text) -> str:
    """``text`` as a message or a table may show it: unchanged when every character
    is printable, else its ``repr`` (quoted, with ``\\x1c``, ``\\n``, ``\\x00``, ...
    escaped).

    For any string read from an untrusted file (an op name, a method, input or value
    name, a dtype, a constant key) that goes into an error message or ``vkdelegate
    inspect`` output: a raw control character would split one message into several
    lines (``str.splitlines`` splits on ``\\x1c``..``\\x1e``, ``\\x85``, ``\\u2028``
    too) or garble a terminal. Normal names keep their unquoted form.
    """
    text = str(text)
    return text if text.isprintable() else repr(text)


def node_label(node_id, name) -> str:
    """How errors name a node of a delegate graph: ``node 3 (aten.add.Tensor)``, the op
    name ``printable`` (it comes from the blob)."""
    return f"node {node_id} ({printable(name)})"


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, ``printable``: for a VkDelegateError that
    wraps another library's error (torch's run over several lines: the schema, the
    values); the whole message stays on the chain (``raise ... from exc``)."""
    lines = str(exc).splitlines()
    return printable(lines[0]) if lines else ""

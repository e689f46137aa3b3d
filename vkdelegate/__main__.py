"""``python -m vkdelegate`` is the ``vkdelegate`` command."""
import sys

from vkdelegate.cli import main

sys.exit(main())

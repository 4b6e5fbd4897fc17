"""Write toolgate runtime tools as decorated Python functions.

```python
from toolgate_plugin import Plugin

plugin = Plugin("weather", toolgate_url="http://127.0.0.1:8700")

@plugin.tool()
def get_weather(location: str) -> dict:
    \"\"\"Get weather for a location.\"\"\"
    return {"location": location, "temperature_c": 28}

plugin.run()
```
"""

from .client import RegistrationRefused
from .context import CallContext
from .plugin import Plugin
from .registrar import WatchTiming
from .schema import SchemaError
from .tools import AsyncCapability, DeliveryMode, ReplaySafety, SideEffectLevel, Slot, Tool, ToolOptions

__all__ = [
    "AsyncCapability",
    "CallContext",
    "DeliveryMode",
    "Plugin",
    "RegistrationRefused",
    "ReplaySafety",
    "SchemaError",
    "SideEffectLevel",
    "Slot",
    "Tool",
    "ToolOptions",
    "WatchTiming",
]

"""A runnable toolgate plugin: two weather tools, one sync and one async.

    pip install ./sdk/python
    TOOLGATE_URL=http://127.0.0.1:8700 python sdk/python/examples/weather.py

Ctrl-C (SIGINT) or SIGTERM removes its tools from toolgate and exits.
"""

import asyncio
import logging
import os
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from toolgate_plugin import Plugin

plugin = Plugin("weather", toolgate_url=os.environ.get("TOOLGATE_URL", "http://127.0.0.1:8700"))

TEMPERATURES_C = {"shanghai": 28.0, "tokyo": 22.5, "reykjavik": 4.0}


class Place(BaseModel):
    """A city, optionally with its country."""

    city: str
    country: str | None = None


@plugin.tool(timeout_seconds=5)
def get_weather(
    location: Annotated[str, Field(description="City name, e.g. Shanghai")],
    unit: Literal["celsius", "fahrenheit"] = "celsius",
) -> dict:
    """Get the current weather for a location."""
    celsius = TEMPERATURES_C.get(location.lower())
    if celsius is None:
        raise LookupError(f"no weather known for {location}")
    value = celsius if unit == "celsius" else celsius * 9 / 5 + 32
    return {"location": location, "temperature": value, "unit": unit}


@plugin.tool(side_effect_level="none", allowed_slots=["narrator", "director"])
async def compare_weather(places: list[Place]) -> list[dict]:
    """Compare the temperature of several places, warmest first."""
    await asyncio.sleep(0)  # an async tool may await I/O here
    known = [(TEMPERATURES_C[p.city.lower()], p.city) for p in places if p.city.lower() in TEMPERATURES_C]
    return [{"city": city, "temperature_c": t} for t, city in sorted(known, reverse=True)]


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    plugin.run()

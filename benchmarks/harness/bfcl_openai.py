"""BFCL functions -> OpenAI chat-completions tools, as BFCL's own OpenAI handler converts them.

A copy of the ``ModelStyle.OPENAI_COMPLETIONS`` path of ``convert_to_tool`` and of
``_cast_to_openai_type`` / ``GORILLA_TO_OPENAPI`` from the ``bfcl-eval`` package 2026.3.23
(bfcl_eval/model_handler/utils.py, bfcl_eval/constants/type_mappings.py), Copyright the
Gorilla / BFCL authors, Apache License 2.0 (benchmarks/data/bfcl/LICENSE). Changes: type
hints, the other model styles left out. What it does: ``.`` in names -> ``_`` (OpenAI's name
pattern), ``dict`` -> ``object`` and the other Gorilla/Java/JS type names -> JSON Schema types,
unknown types -> ``string``, ``float`` marked with ``format: float`` and a description note.
"""

from __future__ import annotations

import copy
import re
from typing import Any

GORILLA_TO_OPENAPI = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
    "byte": "integer",
    "short": "integer",
    "long": "integer",
    "double": "number",
    "char": "string",
    "ArrayList": "array",
    "Array": "array",
    "HashMap": "object",
    "Hashtable": "object",
    "Queue": "array",
    "Stack": "array",
    "Any": "string",
    "String": "string",
    "Bigint": "integer",
}


def _cast_to_openai_type(properties: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    for key, value in properties.items():
        if "type" not in value:
            properties[key]["type"] = "string"
        else:
            var_type = value["type"]
            if mapping == GORILLA_TO_OPENAPI and var_type == "float":
                properties[key]["format"] = "float"
                properties[key]["description"] += " This is a float type value."
            properties[key]["type"] = mapping.get(var_type, "string")
        # supported: list of any, list of list of any, list of dict, list of list of dict, dict of any
        if properties[key]["type"] in ("array", "object"):
            if "properties" in properties[key]:
                properties[key]["properties"] = _cast_to_openai_type(properties[key]["properties"], mapping)
            elif "items" in properties[key]:
                items = properties[key]["items"]
                items["type"] = mapping[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast_to_openai_type(items["properties"], mapping)
    return properties


def convert_to_tool(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL ``function`` entries -> ``[{"type": "function", "function": {...}}]``."""
    functions = copy.deepcopy(functions)
    tools = []
    for item in functions:
        if "." in item["name"]:
            item["name"] = re.sub(r"\.", "_", item["name"])
        item["parameters"]["type"] = "object"
        item["parameters"]["properties"] = _cast_to_openai_type(
            item["parameters"]["properties"], GORILLA_TO_OPENAPI
        )
        tools.append({"type": "function", "function": item})
    return tools

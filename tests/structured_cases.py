"""JSON schemas and prompts for the structured-output tests: each reply must parse and validate.

Free strings carry maxLength and arrays maxItems, so a small greedy model that starts repeating
still ends inside max_tokens (the grammar enforces the bounds, so the reply stays valid).
"""
from __future__ import annotations

S = {"type": "string", "maxLength": 40}


def obj(props: dict, required: list[str] | None = None, **kw) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False, **kw}


CASES: list[tuple[str, dict, str]] = [
    ("person", obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 130}}),
     "Describe Ann, who is 31, as JSON."),
    ("city", obj({"city": S, "country": S, "population": {"type": "integer", "minimum": 0}}),
     "Give the largest city of Japan as JSON."),
    ("boolean", obj({"is_prime": {"type": "boolean"}}), "Is 17 a prime number? Answer in JSON."),
    ("number", obj({"celsius": {"type": "number"}, "fahrenheit": {"type": "number"}}),
     "Convert 100 degrees Celsius to Fahrenheit, as JSON."),
    ("enum", obj({"sentiment": {"enum": ["positive", "negative", "neutral"]}}),
     "What is the sentiment of: 'I love this product!'? JSON please."),
    ("const", obj({"version": {"const": 2}, "ok": {"type": "boolean"}}), "Return a status object."),
    ("array of strings", obj({"colors": {"type": "array", "items": S, "minItems": 3, "maxItems": 3}}),
     "List three colors of the rainbow as JSON."),
    ("array of ints", obj({"primes": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 10}}),
     "List the first five prime numbers in JSON."),
    ("nested", obj({"user": obj({"id": {"type": "integer"}, "email": S}), "active": {"type": "boolean"}}),
     "Make a JSON record for user 7 with email bob@example.com who is active."),
    ("array of objects", obj({"items": {"type": "array", "maxItems": 4, "minItems": 2,
                                        "items": obj({"name": S, "price": {"type": "number", "minimum": 0}})}}),
     "A shopping list of two fruits with prices, in JSON."),
    ("optional field", obj({"title": S, "subtitle": S}, required=["title"]),
     "Give a book title as JSON."),
    ("nullable", obj({"middle_name": {"type": ["string", "null"], "maxLength": 20}, "first": S}),
     "JSON for the name 'John Smith' (no middle name)."),
    ("anyOf", obj({"value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 10}]}}),
     "Give a value in JSON."),
    ("ref", {"$defs": {"pt": obj({"x": {"type": "number"}, "y": {"type": "number"}})},
             **obj({"start": {"$ref": "#/$defs/pt"}, "end": {"$ref": "#/$defs/pt"}})},
     "A line segment from the origin to (3, 4) as JSON."),
    ("pattern", obj({"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}), "A US zip code for New York, as JSON."),
    ("string lengths", obj({"code": {"type": "string", "minLength": 3, "maxLength": 3}}),
     "The three-letter IATA code of Paris CDG airport in JSON."),
    ("integer range", obj({"rating": {"type": "integer", "minimum": 1, "maximum": 5}}),
     "Rate the movie Inception from 1 to 5 in JSON."),
    ("date format", obj({"date": {"type": "string", "format": "date"}}), "Give the date of New Year 2025 in JSON."),
    ("email format", obj({"email": {"type": "string", "format": "email"}}), "Give an example email address in JSON."),
    ("uuid format", obj({"id": {"type": "string", "format": "uuid"}}), "Give a random id in JSON."),
    ("top-level array", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 5},
     "Give a JSON array of some even numbers."),
    ("enum of ints", obj({"http_status": {"enum": [200, 404, 500]}}), "Which HTTP status means not found? JSON."),
    ("many fields", obj({"a": {"type": "integer"}, "b": {"type": "integer"}, "sum": {"type": "integer"},
                         "explanation": S}), "Add 2 and 3, show the work as JSON."),
    ("deep nesting", obj({"l1": obj({"l2": obj({"l3": obj({"leaf": S})})})}), "A deeply nested JSON object."),
    ("tuple", obj({"rgb": {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 255}] * 3,
                           "items": False, "minItems": 3}}), "The RGB color of pure red, as JSON."),
    ("code", obj({"language": {"enum": ["python", "javascript", "go"]}, "code": {"type": "string", "maxLength": 120}}),
     "Write a Python function that adds two numbers; answer as JSON."),
    ("classification", obj({"label": {"enum": ["bug", "feature", "question"]}, "confidence": {"type": "number",
                                                                                               "minimum": 0, "maximum": 1}}),
     "Classify this issue: 'The app crashes on startup.' Answer in JSON."),
    ("extraction", obj({"people": {"type": "array", "maxItems": 3, "items": S}, "place": S}),
     "Extract people and place from: 'Alice and Bob met in Rome.' JSON."),
    ("oneOf", obj({"shape": {"oneOf": [obj({"kind": {"const": "circle"}, "r": {"type": "number"}}),
                                       obj({"kind": {"const": "square"}, "side": {"type": "number"}})]}}),
     "Describe a circle of radius 2 as JSON."),
    ("key/value map", {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 4},
     "Count the letters in 'aab' as a JSON object."),
    ("multilingual", obj({"greeting": S, "language": S}), "Say hello in French, as JSON."),
    ("unicode", obj({"emoji": {"type": "string", "maxLength": 8}, "meaning": S}), "An emoji and its meaning, as JSON."),
    ("summary", obj({"summary": {"type": "string", "maxLength": 80}, "keywords": {"type": "array", "items": S,
                                                                                 "maxItems": 3}}),
     "Summarize: 'The cat sat on the mat all day.' JSON."),
]

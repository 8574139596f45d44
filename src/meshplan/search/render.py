"""Text and JSON views of a search result (placeholder, filled below)."""
def render_text(result) -> str:
    return ""
def result_json(result) -> dict:
    return {}

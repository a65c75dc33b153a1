"""The `/v1/systemone` HTTP server (FastAPI on uvicorn): thin, no model logic."""

"""laya for agents: `laya mcp`, the decision tools over the Model Context Protocol (`laya.agents.mcp`)."""

"""Multi-turn conversation replay: sessions built from chat conversations
(derive), and the closed loop that turns a finished turn into the next one
(session)."""

"""Research tasks over the local web: questions, answers, evidence and gold paths."""

# A result, intermediates, logs and printed output, using the sandbox's tools.
text = "the quick brown fox jumps over the lazy dog the end"
print("counting words in", repr(text[:20] + "..."))
emit_intermediate("word_count", word_count(text))
emit_log("looking for the most frequent words")
top = top_words(text, n=2)
emit_intermediate("top_words", top)
emit_result({"words": word_count(text), "top": top, "stats": summarize([3, 1, 4, 1, 5])})

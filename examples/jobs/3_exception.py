# An exception: the agent gets the error and the script's own traceback.
def ratio(a, b):
    return a / b

print("about to divide by zero")
emit_result(ratio(1, 0))

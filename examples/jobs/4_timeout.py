# A script that never ends is stopped at its timeout (submitted with --timeout 1).
while True:
    pass

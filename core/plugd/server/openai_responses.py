"""placeholder: being written"""

ROUTES: list = []

"""dpopt's own checks of what the engines return: optimality certificates, the return to
original units with every constraint checked, and error bars of the certified point.
"""

"""python -m tutti.cli"""
from . import main

main()

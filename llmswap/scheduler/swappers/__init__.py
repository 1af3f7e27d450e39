"""scheduler/swappers"""

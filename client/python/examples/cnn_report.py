import sys; print("report", sys.argv)

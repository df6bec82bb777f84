"""The discovery API's HTTP face: the Litestar app and its routes, who is calling and what they may
touch, request bounds and bodies, the error shape, the models.
"""

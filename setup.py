"""Builds the cffi extension transport.native._native; everything else is in pyproject.toml."""

from setuptools import setup

setup(cffi_modules=["transport/native/build.py:ffibuilder"])
